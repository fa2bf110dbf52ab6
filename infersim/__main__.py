import gc

# A plain run allocates ~12,000 objects that live until it ends and frees few, so the cyclic
# collector, run every 700 allocations by default, scanned them 18 times for nothing (~2 ms). At
# 50,000 a plain run is not collected at all, and a long sweep still is, as often per object made.
gc.set_threshold(50_000, *gc.get_threshold()[1:])

# The command-line process (not a program importing infersim as a library) takes the dataclasses'
# generated methods compiled from the on-disk cache, before any module defines its dataclasses
# (see infersim.codecache): it routes the dataclasses module's exec, which only this process sees.
from infersim import codecache  # noqa: E402

codecache.install()

from infersim.cli import exit_now, main  # noqa: E402

exit_now(main())
