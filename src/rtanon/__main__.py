import sys

from rtanon.cli import main

sys.exit(main())
