#include "test.h"
int main(void){ return test_summary(); }
