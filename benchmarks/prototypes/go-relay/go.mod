module pdoperator/benchmarks/go-relay

go 1.21
