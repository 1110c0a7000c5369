python a_c03.py
