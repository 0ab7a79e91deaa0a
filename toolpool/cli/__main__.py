from toolpool.cli import main

raise SystemExit(main())
