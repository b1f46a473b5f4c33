"""`python -m pd.compare RUN_A RUN_B`: seed consistency of two decompositions of one target
(`pd.train.compare`)."""

import sys

if __name__ == "__main__":
    from pd.train.compare import main

    sys.exit(main())
