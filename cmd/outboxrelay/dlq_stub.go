package main

import "io"

func cmdDLQ(args []string, stdout io.Writer) error {
	return usageErr("dlq: not available in this build")
}
