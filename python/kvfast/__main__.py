import sys

from kvfast.cli.commands import main

sys.exit(main())
