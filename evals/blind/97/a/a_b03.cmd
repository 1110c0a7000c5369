python a_b03.py
