module pd-operator/images/pause

go 1.22
