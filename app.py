"""specdec demo: watch speculative decoding round by round (`python app.py`, then open http://127.0.0.1:7860).

The app itself lives in `components.demo` (installed as `specdec.ui.demo`, started by `specdec app`);
this file starts it from a checkout and is the Space's entry point.
"""
from components.app_args import parse_args, prefix_cache, prefix_cache_bytes  # noqa: F401 (the app's flags)
from components.demo import build_demo, examples, gpu, launch_kwargs, main  # noqa: F401

if __name__ == "__main__":
    main()
