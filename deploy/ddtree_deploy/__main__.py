"""``python -m ddtree_deploy`` is the same as the ``ddtree-deploy`` console script."""

from ddtree_deploy._entry import main

main()
