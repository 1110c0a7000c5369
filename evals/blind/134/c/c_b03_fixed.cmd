python c_b03_fixed.py
