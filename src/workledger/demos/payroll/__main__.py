"""``python -m workledger.demos.payroll worker --db URL --out DIR --smtp HOST:PORT``."""

import sys

from workledger.demos.payroll.worker import main

sys.exit(main())
