import sys

from distseq.cli import main

sys.exit(main())
