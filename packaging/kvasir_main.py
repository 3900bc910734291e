"""The frozen app's entry point: the same ``kvasir`` command as the pip-installed one.

The app starts its chat-template workers by running itself with ``--template-worker``; that case is handled first,
before the app (and Qt) is imported.
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--template-worker"]:
        from engine.templates.worker import main as template_worker

        sys.exit(template_worker(sys.argv[2:]))
    from app.__main__ import main

    sys.exit(main())
