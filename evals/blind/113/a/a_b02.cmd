python a_b02.py
