package saga_test

const childEnv = "SAGA_TEST_CHILD"

func runChild() {}
