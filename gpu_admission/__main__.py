from gpu_admission.cli import main

main()
