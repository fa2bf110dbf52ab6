# The command-line process (not a program importing infersim as a library) takes the dataclasses'
# generated methods compiled from the on-disk cache, before any module defines its dataclasses
# (see infersim.codecache): it routes the dataclasses module's exec, which only this process sees.
from infersim import codecache

codecache.install()

from infersim.cli import exit_now, main  # noqa: E402

exit_now(main())
