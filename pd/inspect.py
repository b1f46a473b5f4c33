"""`python -m pd.inspect RUN_DIR`: what each subcomponent of a run responds to, as
`RUN_DIR/inspect/harvest.npz` and `components.html` (`pd.train.inspection`)."""

import sys

if __name__ == "__main__":
    from pd.train.inspection import main

    sys.exit(main())
