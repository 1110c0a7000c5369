python c_b01_fixed.py
