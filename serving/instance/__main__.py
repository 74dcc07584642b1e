"""``python -m serving.instance --package PKG.tar --workdir DIR``: see :mod:`serving.instance`."""

import sys

from serving.instance.supervisor import main

sys.exit(main())
