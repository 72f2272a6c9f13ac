from seqrec.cli import main

raise SystemExit(main())
