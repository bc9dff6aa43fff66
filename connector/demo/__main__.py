import sys

from connector.demo.job import main

sys.exit(main())
