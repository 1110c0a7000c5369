python c_b02_fixed.py
