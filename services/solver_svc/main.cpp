// solver_svc entry point: placeholder until the service loop lands.
int main() { return 0; }
