from .serve.cli import main

raise SystemExit(main())
