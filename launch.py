"""The one entry point, from a checkout: `python launch.py --config=configs/<job>.py --workdir=DIR`.

The same as the installed `tailaware` command; its flags and what it does are
`tailaware/jobs/launch.py`.
"""

from tailaware.jobs import launch

if __name__ == "__main__":
    launch.main()
