"""fedlit on Flower: the server's rounds and the clients' turns as Flower apps (needs ``flwr``)."""
