"""Speculative decoding: `ngram.py` and `draft.py` propose, `rejection.py` verifies losslessly,
`speculator.py` runs both around a step, `control.py` is the live on/off switch and depth."""
