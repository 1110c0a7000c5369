python c_b02_fixed.py --port 49222
