python c_b02.py
