python a_b02_fixed.py
