"""See a run: report scalars from any process and serve the live dashboard.

```python
import stratax as sx
sx.observe.record(step=100, loss=0.25, pull_s=0.003)   # appends to $STRATAX_RUN_DIR/metrics/
server = sx.observe.serve_dashboard("runs/exp1")         # http://127.0.0.1:<port>/
print(server.url)
```

``stratax launch --dashboard``, ``stratax train --dashboard`` and ``stratax dashboard RUN_DIR``
do the same from the command line. Pure Python: importing it starts neither JAX nor Keras.
"""

from stratax._src.observe.events import EventLog
from stratax._src.observe.reader import RunReader
from stratax._src.observe.record import MetricsWriter, record
from stratax._src.observe.server import DashboardServer, serve_dashboard

__all__ = ["DashboardServer", "EventLog", "MetricsWriter", "RunReader", "record",
           "serve_dashboard"]
