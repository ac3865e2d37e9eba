"""``python -m stratax ...`` runs the ``stratax`` command (``train``, ``launch``).

So ``stratax launch --nproc-per-node 2 -m stratax train`` works like the console script. The CLI
itself decides what to import: parsing imports neither JAX nor Keras.
"""

import sys

from stratax._src.cli import main

if __name__ == "__main__":
    sys.exit(main())
