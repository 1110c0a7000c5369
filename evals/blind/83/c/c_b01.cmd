python c_b01.py --port 34201
