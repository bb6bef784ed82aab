package main

import "io"

func cmdStatus(args []string, stdout io.Writer) error {
	return usageErr("status: not available in this build")
}

func cmdDLQ(args []string, stdout io.Writer) error {
	return usageErr("dlq: not available in this build")
}
