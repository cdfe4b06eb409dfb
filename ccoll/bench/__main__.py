from ..launch import exit_process
from .harness import main

exit_process(main())
