from dlcomm.cli import main

raise SystemExit(main())
