"""``python -m deploy.cli``: the installed ``lambda-platform`` command, for a checkout without the script."""

from deploy.cli.main import main

main()
