# Imported by a --warm-start standby in the tests (--warm-import=warm_thread): it starts a thread,
# so the standby is not forked and becomes the worker itself.
import threading
import time
import xml.dom.minidom  # noqa: F401  (warm_probe's sign of a warm start)

threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
