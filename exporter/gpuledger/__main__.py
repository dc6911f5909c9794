import sys

from gpuledger.cli.main import main

sys.exit(main())
