import sys

from kvfast.cli import main

sys.exit(main())
