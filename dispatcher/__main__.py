import sys

from dispatcher.cli.commands import main

sys.exit(main())
