python c_b01.py --port 49201
