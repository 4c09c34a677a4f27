"""`python -m tailaware --config=<job> --workdir=DIR`: the `tailaware` command (launch.py).

Runs the job a config names: a config file, or the name of one tailaware ships (`default`, the
demo, is the default; an unknown name lists them); `--config.<field>=value` overrides a field.
Its flags and what it does are `tailaware/jobs/launch.py`.
"""

from tailaware.jobs import launch

if __name__ == "__main__":
    launch.main()
