import sys

from stallscope.cli import main

sys.exit(main())
