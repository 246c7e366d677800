"""Kept for old command lines: ``python scripts/flower_certs.py ARGS`` is ``fedlit certs ARGS``
(:mod:`fedlit.flower.certs`)."""

from fedlit.flower.certs import main, make_certificates

__all__ = ["main", "make_certificates"]

if __name__ == "__main__":
    main()
