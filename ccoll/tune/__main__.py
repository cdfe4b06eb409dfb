from ..launch import exit_process
from .cli import main

exit_process(main())
