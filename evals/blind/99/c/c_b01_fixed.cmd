python c_b01_fixed.py --port 49202
