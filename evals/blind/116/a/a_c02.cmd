python a_c02.py
