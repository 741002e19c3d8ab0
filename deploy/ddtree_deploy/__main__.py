"""``python -m ddtree_deploy`` is the same as the ``ddtree-deploy`` console script."""

from .cli import main

main()
