python c_b01.py --port 33201
