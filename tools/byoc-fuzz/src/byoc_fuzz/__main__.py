"""``python -m byoc_fuzz``: see :mod:`byoc_fuzz`."""

from byoc_fuzz import main

raise SystemExit(main())
