import sys

from ctrcal.cli import main

sys.exit(main())
