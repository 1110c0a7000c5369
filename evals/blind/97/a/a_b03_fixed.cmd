python a_b03_fixed.py
