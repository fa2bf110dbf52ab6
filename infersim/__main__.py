from infersim.cli import main

raise SystemExit(main())
